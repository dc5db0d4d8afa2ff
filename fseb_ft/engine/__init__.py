"""The engine layer: a run's phases, the training loop and its callbacks, and the machinery the
commands share. Imports any layer below it; only the command modules import it."""
