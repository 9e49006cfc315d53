"""`python -m mbalancer.config_reference`: write docs/configuration.md from the typed settings."""
import sys

from mbalancer.config_reference import main

sys.exit(main())
