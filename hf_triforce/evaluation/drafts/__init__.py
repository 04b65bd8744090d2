"""``hf-triforce eval-drafts``: how well levels 0 and 1 draft on real long context (see :mod:`.run`).

The measure itself is :mod:`.acceptance` against full-cache references (:mod:`.reference`); level 1 is
replayed over view policies (:mod:`.view_policy`, :mod:`.level1`), level 0 over the same references
(:mod:`.level0`), and the report pools it all (:mod:`.summary`, :mod:`.report`).
"""
