"""MBalancer's tests (a regular package: ryu's dependency tinyrpc installs a top-level `tests` package of its own,
which would otherwise win over this folder)."""
