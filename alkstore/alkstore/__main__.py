"""``python -m alkstore``: the ``alkstore`` command (docs/command.md)."""

from alkstore.cli import main

if __name__ == "__main__":
    main()
