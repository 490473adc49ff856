"""HTTP views: parse input, call one service or selector, render."""
