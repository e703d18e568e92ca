"""``radixserve serve --models-dir DIR``: many models behind one server.

`catalog` lists the models in the folder, `hub.ModelHub` loads them on demand (one engine
process set per loaded model, LRU eviction, idle unload, keep_alive, memory accounting),
`routes` is the ASGI front (the hub's own routes, then every other request forwarded in-process
to the app of the model its body names) and `main` runs it."""
