"""The Ember desktop application: main window, actions, undo, project files, settings."""
