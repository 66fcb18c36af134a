"""The subcommands of the ``daliload`` console script (:mod:`daliload.cli`) that are not a concept's own.

Each module is one subcommand and exposes the same three names, ``HELP``
(one line), ``add_arguments(parser)`` and ``run(args) -> int``, so this
``__init__`` re-exports nothing: :data:`daliload.cli.COMMANDS` names the
modules, and a caller imports the one it means (``from
daliload.commands.preview import preview``).

* :mod:`.demo`: ``daliload demo``, generate a dataset, scan it, train on it,
  write the report (:func:`~daliload.commands.demo.run_demo`);
* :mod:`.preview`: ``daliload preview``, a contact sheet of a split's clips
  as the loader delivers them (:func:`~daliload.commands.preview.preview`);
* :mod:`.bench`: ``daliload bench``, where the benchmarks are and how to run them.

The subcommands of a concept live with it: ``scan`` in
:mod:`daliload.prescreen.cli`, ``synth`` in :mod:`daliload.synth.cli`,
``transcode`` in :mod:`daliload.transcode.cli`.
"""
