"""The training runtime, in named parts: ``build`` (every part of a run from its config),
``acting`` (the acting thread's loop), ``learner_loop`` (the learner thread's loop), ``schedule``
(periodic jobs: metrics rows, checkpoints, milestones, evaluations), ``stats`` (the metrics rows
the parts report into), ``stopping`` (stop signals, the time limit), ``peers`` (what several
learner ranks trade), ``checkpoint_source`` (what a checkpoint copies), ``concurrency`` (the thread
and process policy), ``resume`` (a checkpoint restored), ``hooks`` (a caller's say in a session) and
``train`` (the run, top to bottom); beside them the agent, checkpoints, metrics, progress, run
folders (``rundir``: their one owner), preflight checks, learner ranks and the init probe."""
