"""`eaglespec serve`'s server: OpenAI request and response bodies (schemas.py), the thread that owns the engine and runs
its continuous-batching loop (worker.py), and the FastAPI app on top (app.py); the command is cli/serve.py."""
