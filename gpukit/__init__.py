"""The GPU kit: everything a short GPU loan needs, prepared on a machine with the package registries.

``python -m gpukit prepare`` fills the git-ignored kit folder (wheels the GPU machine lacks, the CIFAR-10 tar);
``python3 -m gpukit run --out DIR`` runs there, every phase under its own time budget, and leaves ``summary.md``
and one archive in DIR; ``--rehearse`` runs the same phases on this CPU at tiny sizes. vitzoo never imports it.
The GPU side (``run`` and what it imports) is stdlib only: it runs before the kit's wheels are installed.
"""
