"""The simulator: scenarios, a discrete-event clock, metrics and plots over the domain code."""
