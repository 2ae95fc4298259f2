"""In-repo defaults only (nothing task-specific): candidate trees and docs are not test modules."""
collect_ignore_glob = ["examples/*", "tests/candidates/*", "docs/*", "tools/*"]
