"""The actor runtime: Plans (tasks with register descriptors), registers, actors that talk by
messages through a message bus, and the runtime that runs a Plan once per graph call."""
