"""What is sent, the same everywhere: the arrival generator and the layout of prompts."""
