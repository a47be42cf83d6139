"""The ground floor: values, names, labels, the clock, the registry. No I/O."""
