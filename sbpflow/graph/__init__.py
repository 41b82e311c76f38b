"""Static graphs: the Job IR, lazy tracing of `nn.Graph.build()`, the passes that rewrite a
Job, and the compiler that lowers it to a runtime Plan.  See ir.py for the IR."""
