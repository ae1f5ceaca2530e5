"""d4rl.gym_mujoco stand-in: the real module registers the gym v2 offline envs; ``gym.make`` here resolves dataset
names itself (ravl_shim.GymEnv), so there is nothing to register."""
