"""Reading and writing: scenario files, CSV and .npy, pasted text, generated code."""
