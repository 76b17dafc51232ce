"""Execution plans: which runtime runs each component, and the cache of the preset bundles built on first use.

* :mod:`qtts.plans.plan`: the plan file (components -> impl, artifacts, options, precision), presets' names,
  and the bundle folder it describes: its manifest and the checkpoint fingerprint it records;
* :mod:`qtts.plans.cache`: the presets and ``$QTTS_CACHE``: find, build (once) and resolve a plan;
* :mod:`qtts.plans.build`: a missing plan built in a child process, with progress.

The runtimes that run what a plan names live in :mod:`qtts.backends`.
"""
