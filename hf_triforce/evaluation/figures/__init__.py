"""Figures and the docs' pages drawn from results (matplotlib, the optional ``bench`` extra, loaded on use).

* :mod:`.bench_plot`: ``hf-triforce bench --plot``, speedup and step latency against context length;
* :mod:`.drafts_plot`: the figure beside an ``hf-triforce eval-drafts`` report;
* :mod:`.plots`: ``make plots``, every recorded result's tables and figures for the docs, through
  :mod:`.bench_page`, :mod:`.tuning_page` and :mod:`.drafts_page`; :mod:`.pyplot` holds what they share.
"""
