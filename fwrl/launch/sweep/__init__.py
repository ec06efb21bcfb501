"""``fwrl sweep``: a grid of training runs (games x cores x seeds x ...), each a normal run folder.

A sweep folder holds::

    SWEEP/sweep.yaml          the grid (axes, common settings) and its cells, with their labels
    SWEEP/configs/CELL.yaml   each cell's full training config (fwrl train --config)
    SWEEP/runs/CELL/          each cell's run folder (fwrl train --runs-dir SWEEP/runs --name CELL)
    SWEEP/status/CELL.json    each cell's state, exit code, times and log (written atomically)
    SWEEP/logs/CELL.log       the output of the cell's fwrl train / fwrl evaluate
    SWEEP/slurm/              array scripts and job ids of the slurm executor

Modules, one job each: :mod:`.options` (the command's own settings),
:mod:`.grid` (axes and cells from a YAML file and flags), :mod:`.plan` (the
sweep folder: manifest, configs, what is left to run), :mod:`.status` (cell
status files and locks), :mod:`.cell` (the per-cell entry point every executor
runs: ``python -m fwrl.launch.sweep.cell SWEEP CELL``), :mod:`.sweep_progress`
(counts and ETA), :mod:`.local`, :mod:`.ray_executor`, :mod:`.slurm` (the
executors) and :mod:`.command` (``fwrl sweep`` itself).
"""
