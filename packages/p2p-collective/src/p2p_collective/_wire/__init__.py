"""Wire: a frame's trip over a link: header receives posted ahead, frames put on and taken off."""
