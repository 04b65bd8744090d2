"""TriForce as a decoding method in the layout transformers expects of a Hub repository (needs ``hf_triforce``):
``model.generate(ids, custom_generate=hf_triforce.CUSTOM_GENERATE_DIR, trust_remote_code=True, triforce_config=c)``."""

from hf_triforce.generation.custom import hub_generate


def generate(model, *args, **kwargs):
    """``generate()``'s arguments, decoded by TriForce (``triforce_config`` defaults to ``TriForceConfig()``)."""
    return hub_generate(model, *args, **kwargs)
