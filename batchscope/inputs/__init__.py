"""Bad input as one line: exit codes, the field a validation error names, and which flags and fields are secret."""
