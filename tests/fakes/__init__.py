"""Stand-ins for packages the CPU machine cannot run (tests import them by name)."""
