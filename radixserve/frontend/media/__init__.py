"""Images into the API process: which sources a request may name (`policy.MediaPolicy`, from
the server's flags), reading and decoding them (`loader`), and the image parts of a chat
request (`chat`). Torch-free; Pillow and httpx are imported by `loader` only, so the server's
flag parser stays light."""
