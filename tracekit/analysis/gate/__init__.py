"""Gate: a release check with budgets, Holm-corrected intervals and pass/fail/inconclusive."""
