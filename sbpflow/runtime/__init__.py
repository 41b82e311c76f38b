"""The actor runtime: Plans (tasks with register descriptors), registers, actors that talk by
messages through a message bus, and the runtime that runs a Plan once per graph call.

    plan = graph.compiler.compile_job(job)          # the graph layer lowers a Job
    rt = Runtime(plan, variables, resolve=...)      # link: kernels, chains, actors
    outs = rt.run(inputs, feeds)                    # one graph call = one VM instruction
"""

from .plan import OpDesc, Plan, RegisterDesc, TaskDesc, TensorDesc
from .runtime import Runtime

__all__ = ["OpDesc", "Plan", "RegisterDesc", "Runtime", "TaskDesc", "TensorDesc"]
