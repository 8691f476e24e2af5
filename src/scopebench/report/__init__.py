"""Reports of benchopt results: phase tables, diagnosis, PNG plots, one offline HTML file, A/B compare.

Modules: :mod:`.results` (reading files, configurations and their regions), :mod:`.tables`
(phase tables), :mod:`.diagnosis` (rules; the machine's in :mod:`.host_rules`, the memory's in
:mod:`.memory_rules`, what they share in :mod:`.findings`), :mod:`.backend_comparison`
(backends side by side), :mod:`.figures` (data of each picture), :mod:`.plots` (PNG; with
:mod:`.memory_figures`, both drawn through :mod:`.drawing`), :mod:`.html` (self-contained
HTML), :mod:`.build` (``scopebench report``), :mod:`.compare` (``scopebench compare``),
:mod:`.dashboard` (BenchOpt's ``benchopt plot`` custom plots). Heavy packages (pandas,
matplotlib, plotly) are imported inside the functions that need them.
"""
