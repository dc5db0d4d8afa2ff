"""``python -m fseb_ft.config --reference``, kept from before the recipe layer had a folder.

Prints the recipe reference (docs/recipes.md); ``fseb_ft.config``'s names are those of
:mod:`fseb_ft.recipe`.
"""

from fseb_ft.recipe import *  # noqa: F403
from fseb_ft.recipe import __all__  # noqa: F401
from fseb_ft.recipe.load import main

if __name__ == "__main__":
    main()
