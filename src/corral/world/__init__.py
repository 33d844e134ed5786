"""The world model: pure computations over what the store records — which agents run, how full
each environment is, who spawned and who waits for whom, what each job led to — and the
detectors that read it (deadlocks). Reading the store and acting on findings is the services'
and the runtime's (services/world.py, runtime/worldwatch.py)."""
