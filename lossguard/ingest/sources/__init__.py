"""Where bytes come from: run discovery, complete lines of text files, and TFRecord framing."""
