"""The one-line error every CLI (``hf-triforce``, ``python -m research.lab_bench``) gives a user mistake."""

from __future__ import annotations

from collections.abc import Callable


def one_line_error(entry: Callable[[list[str]], int], capsys, argv: list[str], expected: str) -> str:
    """Run ``entry(argv)``: exit status 2, no traceback, exactly one ``hf-triforce: error: ...`` line holding
    ``expected`` on stderr (which may also hold transformers' loading progress bars); that line."""
    assert entry(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("hf-triforce: error: "), err
    assert expected in errors[0], err
    return errors[0]
