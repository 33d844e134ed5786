"""Pure values of Corral: jobs, attempts, permits, states and errors. Imports nothing of Corral."""
