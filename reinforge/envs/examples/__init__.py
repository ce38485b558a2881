"""Environments written for other frameworks' interfaces, shipped so that their recipes run as they are:
a `verifiers` taskset (`vf_addition`) and the views that let a tiny model play a TextArena game
(`textarena_views`). docs/environments.md, "Learning results"."""
