"""``python -m drumbeat``: the same as the ``drumbeat`` command."""

from drumbeat.cli import main

if __name__ == "__main__":
    main()
