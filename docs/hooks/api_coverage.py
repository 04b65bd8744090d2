"""mkdocs hook: the API reference documents every name in ``hf_triforce.__all__``, each with a docstring.

A public name missing from ``docs/reference.md`` (as a ``::: hf_triforce.NAME`` block) or an exported
class or function without a docstring fails the build, so ``mkdocs build --strict`` in CI catches a new
export that was never documented.
"""

from __future__ import annotations

import inspect
import re

from mkdocs.exceptions import PluginError

REFERENCE_PAGE = "reference.md"
_BLOCK = re.compile(r"^::: hf_triforce\.(\w+)\s*$", re.MULTILINE)


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Check the reference page's ``:::`` blocks against ``hf_triforce.__all__``; other pages pass through."""
    if page.file.src_uri != REFERENCE_PAGE:
        return markdown
    import hf_triforce

    documented = set(_BLOCK.findall(markdown))
    missing = sorted(set(hf_triforce.__all__) - documented)
    if missing:
        raise PluginError(f"{REFERENCE_PAGE} does not document hf_triforce.__all__ names {missing}.")
    unknown = sorted(documented - set(hf_triforce.__all__))
    if unknown:
        raise PluginError(f"{REFERENCE_PAGE} documents {unknown}, which are not in hf_triforce.__all__.")
    bare = [name for name in hf_triforce.__all__ if _lacks_docstring(getattr(hf_triforce, name))]
    if bare:
        raise PluginError(f"public names without a docstring: {bare}.")
    return markdown


def _lacks_docstring(obj) -> bool:
    if not (inspect.isclass(obj) or inspect.isfunction(obj)):
        return False  # constants are documented by the attribute docstring griffe reads from the source
    return not (obj.__doc__ or "").strip()
