"""The option lists a recipe field may take, written once for the code and the recipe checks.

Plain constants; this module imports nothing.
"""

AUGMENTATIONS = ("none", "flip", "crop_flip", "randaug-lite")
"""``data.augment``: the training augmentations of :func:`fseb_ft.transforms.train_transform`."""
CONTEXT_KINDS = ("train", "dataset", "mixture")
"""``context.kind``: where context points come from (:func:`fseb_ft.context.build_context_pool`)."""
