"""The formats that cross torchras's package walls, in one place that every package imports and that imports none of
them: standard library only (pyproject.toml, contracts ``formats-alone`` and ``formats-sans-io``).

    endpoint_files   the client ports' endpoint files: rasd writes them, rasd and ``rascli --list`` read them
    launch_events    what a worker's Wrapper (inprocess) tells ``rasd launch`` (torchras.launch): one JSON line each
    journal_lines    the verdict journal's lines: rasd's journal writes them, ``rascli --journal`` reads them
    version          torchras's version (rasd, rascli and the package metadata read it)

A writer and its reader encode and decode with the same module here, so they cannot drift apart.
"""
