"""The capture object, its file format (compact coding, checks) and capture while generating."""
