"""The data layer: images from every source as uint8 arrays, their splits, screening, transforms
and corruptions. Imports only :mod:`fseb_ft.recipe` (and ``errors``, ``logs``).

Its public names, those the other folders and the commands import, are ``__all__``; each is
imported from its module on first use (PEP 562), so importing one module of the folder loads no
other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fseb_ft.lazy import lazy_attributes

if TYPE_CHECKING:  # the names' types, for type checkers: the same names as _LAZY's
    from fseb_ft.data.corruptions import CorruptedImages as CorruptedImages
    from fseb_ft.data.decode_size import min_decode_size as min_decode_size
    from fseb_ft.data.files import file_changes as file_changes
    from fseb_ft.data.files import find_images as find_images
    from fseb_ft.data.files import list_split as list_split
    from fseb_ft.data.files import read_image as read_image
    from fseb_ft.data.holdout import split_records as split_records
    from fseb_ft.data.hub_access import hub_or_cache as hub_or_cache
    from fseb_ft.data.hub_access import offline_hint as offline_hint
    from fseb_ft.data.image_cache import CacheReport as CacheReport
    from fseb_ft.data.image_cache import cache_dir as cache_dir
    from fseb_ft.data.image_cache import cache_images as cache_images
    from fseb_ft.data.image_cache import check_cache_size as check_cache_size
    from fseb_ft.data.images import IndexedImages as IndexedImages
    from fseb_ft.data.images import LabeledImages as LabeledImages
    from fseb_ft.data.inputs import EVAL_RESIZE as EVAL_RESIZE
    from fseb_ft.data.inputs import InputSpec as InputSpec
    from fseb_ft.data.loaders import close_workers as close_workers
    from fseb_ft.data.loaders import make_loader as make_loader
    from fseb_ft.data.loaders import seed_worker as seed_worker
    from fseb_ft.data.pixels import set_max_image_pixels as set_max_image_pixels
    from fseb_ft.data.sampling import BalancedSampler as BalancedSampler
    from fseb_ft.data.screening import BadImage as BadImage
    from fseb_ft.data.screening import apply_policy as apply_policy
    from fseb_ft.data.screening import screen as screen
    from fseb_ft.data.screening import screen_splits as screen_splits
    from fseb_ft.data.sources import build_splits as build_splits
    from fseb_ft.data.sources import hold_outs as hold_outs
    from fseb_ft.data.sources import load_split as load_split
    from fseb_ft.data.sources.registry import find_source as find_source
    from fseb_ft.data.splits import TEST_SPLIT as TEST_SPLIT
    from fseb_ft.data.splits import VALIDATION_SPLIT as VALIDATION_SPLIT
    from fseb_ft.data.splits import Splits as Splits
    from fseb_ft.data.splits import allocate as allocate
    from fseb_ft.data.splits import require_two_classes as require_two_classes
    from fseb_ft.data.splits import stratified_split as stratified_split
    from fseb_ft.data.transforms import TransformedImages as TransformedImages
    from fseb_ft.data.transforms import check_transform_channels as check_transform_channels
    from fseb_ft.data.transforms import epoch_seed as epoch_seed
    from fseb_ft.data.transforms import eval_transform as eval_transform
    from fseb_ft.data.transforms import is_deterministic as is_deterministic
    from fseb_ft.data.transforms import perturbation_transform as perturbation_transform
    from fseb_ft.data.transforms import seed_transform as seed_transform
    from fseb_ft.data.transforms import train_transform as train_transform
    from fseb_ft.data.user_datasets import as_labeled_images as as_labeled_images

_LAZY = {
    "CorruptedImages": "fseb_ft.data.corruptions",
    "min_decode_size": "fseb_ft.data.decode_size",
    "file_changes": "fseb_ft.data.files",
    "find_images": "fseb_ft.data.files",
    "list_split": "fseb_ft.data.files",
    "read_image": "fseb_ft.data.files",
    "split_records": "fseb_ft.data.holdout",
    "hub_or_cache": "fseb_ft.data.hub_access",
    "offline_hint": "fseb_ft.data.hub_access",
    "CacheReport": "fseb_ft.data.image_cache",
    "cache_dir": "fseb_ft.data.image_cache",
    "cache_images": "fseb_ft.data.image_cache",
    "check_cache_size": "fseb_ft.data.image_cache",
    "IndexedImages": "fseb_ft.data.images",
    "LabeledImages": "fseb_ft.data.images",
    "EVAL_RESIZE": "fseb_ft.data.inputs",
    "InputSpec": "fseb_ft.data.inputs",
    "set_max_image_pixels": "fseb_ft.data.pixels",
    "BalancedSampler": "fseb_ft.data.sampling",
    "BadImage": "fseb_ft.data.screening",
    "apply_policy": "fseb_ft.data.screening",
    "screen": "fseb_ft.data.screening",
    "screen_splits": "fseb_ft.data.screening",
    "build_splits": "fseb_ft.data.sources",
    "hold_outs": "fseb_ft.data.sources",
    "load_split": "fseb_ft.data.sources",
    "find_source": "fseb_ft.data.sources.registry",
    "Splits": "fseb_ft.data.splits",
    "TEST_SPLIT": "fseb_ft.data.splits",
    "VALIDATION_SPLIT": "fseb_ft.data.splits",
    "allocate": "fseb_ft.data.splits",
    "require_two_classes": "fseb_ft.data.splits",
    "stratified_split": "fseb_ft.data.splits",
    "TransformedImages": "fseb_ft.data.transforms",
    "check_transform_channels": "fseb_ft.data.transforms",
    "close_workers": "fseb_ft.data.loaders",
    "epoch_seed": "fseb_ft.data.transforms",
    "eval_transform": "fseb_ft.data.transforms",
    "is_deterministic": "fseb_ft.data.transforms",
    "make_loader": "fseb_ft.data.loaders",
    "perturbation_transform": "fseb_ft.data.transforms",
    "seed_transform": "fseb_ft.data.transforms",
    "seed_worker": "fseb_ft.data.loaders",
    "train_transform": "fseb_ft.data.transforms",
    "as_labeled_images": "fseb_ft.data.user_datasets",
}
__all__ = sorted(_LAZY)

__getattr__ = lazy_attributes(__name__, _LAZY)
