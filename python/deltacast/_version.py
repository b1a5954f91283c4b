"""The package version; the Makefile reads it for the library's SONAME and
deltacast.pc, so there is one place to change it."""
__version__ = "0.1.0"
