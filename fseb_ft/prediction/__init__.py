"""The prediction layer: what a trained model does with new images, between the run folder
(``runs``) and the commands: the shift monitor's checks of a batch against the run's validation
split. Imports only the layers below it (runs, evaluation, method, data, recipe)."""
