"""The bundle's entry point: PyInstaller needs a script, and app/__main__.py is a package module."""
import sys

from app.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
