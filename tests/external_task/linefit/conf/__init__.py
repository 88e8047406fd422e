"""Config folder of the linefit task: ``hydra.searchpath=[pkg://linefit.conf]`` adds it."""
