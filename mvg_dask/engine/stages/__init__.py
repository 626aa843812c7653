"""The engine's stages: one function per stage name of :mod:`mvg_dask.plan.stages`.

:func:`~mvg_dask.engine.stages.executor.run_stages` walks a plan's
:attr:`~mvg_dask.plan.release_plan.ReleasePlan.stages` in order, calling each stage with the run's
:class:`~mvg_dask.engine.stages.context.RunContext` and the plan; a stage returns the plan (the
DP-PCA stages return it with its directions filled in). The pure steps inside the stages (the
noisy count, DP-PCA on a Gram matrix, writing a covariance) are public functions of their modules,
which the privacy audit calls without a cluster.
"""
