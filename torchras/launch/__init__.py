"""``rasd launch``: torchrun's command line, a launcher that keeps the survivors and heals the job to full size.

The parts, one concern each:

    args.py         torchrun's options, parsed and resolved the way torchrun resolves them (a ``Plan``)
    environment.py  the environment of one worker: torchrun's variables, and what a replacement needs to join
    store.py        the TCPStore torchrun's agent serves on MASTER_PORT; what the launchers of a job agree on
    output.py       the workers' output as whole lines with prefixes; --redirects, --tee, --log-dir, filters
    workers.py      one worker process; the rules for respawning its local rank, with a back-off
    status.py       the job's exit status from the workers' ends
    ras_node.py     a RAS node in every Python worker: its command line and verdict journal
    worker_main.py  what runs first inside a worker: python -m rasd.run, plus its notes to the launcher
    restarts.py     group restarts of a job without the Wrapper: on a failure or a verdict (its journal)
    main.py         the loop that runs them: signals, ends, respawns, the workers' announcements

docs/operations.md ("rasd launch") is the user's guide.
"""
