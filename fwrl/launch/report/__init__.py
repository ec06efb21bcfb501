"""``fwrl report``: the table of a sweep (or of any runs), as the papers print theirs.

Modules, one job each: :mod:`.options` (the command's settings), :mod:`.collect`
(runs, their final scores and learning curves, groups), :mod:`.baselines`
(published normalisation constants, or a random policy's return, cached),
:mod:`.stats` (per-game bootstrap CIs; IQM, median, mean and performance
profiles with rliable), :mod:`.figures` (PNG), :mod:`.document` (markdown and
HTML) and :mod:`.build` (``fwrl report`` itself).
"""
