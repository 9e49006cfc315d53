"""MBalancer's command line and the pieces every part of the system shares."""

__version__ = "0.1.0"
