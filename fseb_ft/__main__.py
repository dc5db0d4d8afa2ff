"""``python -m fseb_ft``: the ``fseb-ft`` command."""

from fseb_ft.cli import main

main()
