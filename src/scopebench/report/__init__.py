"""Reports of benchopt results: phase tables, diagnosis, PNG plots, one offline HTML file, A/B compare.

Modules: :mod:`.results` (reading files, configurations and their regions), :mod:`.tables`
(phase tables), :mod:`.diagnosis` (rules), :mod:`.backend_comparison` (backends side by side), :mod:`.figures` (data of each picture),
:mod:`.plots` (PNG), :mod:`.html` (self-contained HTML), :mod:`.build` (``scopebench
report``), :mod:`.compare` (``scopebench compare``), :mod:`.dashboard` (BenchOpt's
``benchopt plot`` custom plots). Heavy packages (pandas, matplotlib, plotly) are imported
inside the functions that need them.
"""
