"""The fleet stage: block and abort verdicts of many runs, regrouped by
fingerprint into incidents (incidents.py is pure; stage.py is its Faust app)."""
