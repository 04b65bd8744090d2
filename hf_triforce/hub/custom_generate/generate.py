"""TriForce as a decoding method in the layout transformers expects of a Hub repository.

``model.generate(ids, custom_generate=hf_triforce.CUSTOM_GENERATE_DIR, trust_remote_code=True, triforce_config=cfg)``
runs TriForce (lossless hierarchical speculative decoding) with every ``generate()`` argument, without
``hf_triforce.enable(model)``. It needs the ``hf_triforce`` package installed.
"""

from hf_triforce.generation.custom import hub_generate


def generate(model, *args, **kwargs):
    """``generate()``'s arguments, decoded by TriForce (``triforce_config`` defaults to ``TriForceConfig()``)."""
    return hub_generate(model, *args, **kwargs)
