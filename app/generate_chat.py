"""The Generate tab's chat mode: a conversation with a model whose folder has a chat template.

- The template is read (`engine.train.chat_template.read_chat_template`: small, bounded files) when
  a model from another folder opens; with one, the tab switches to chat mode, without one chat
  mode is unavailable and says why (a base model continues text).
- Send adds the user's message to the conversation (widgets.chat_view.Conversation) and starts the
  panel's worker (`GeneratePanel.start`): each compared column renders its own history (the system
  prompt, the user turns, that column's earlier answers) with the template and a generation
  prompt, encodes it with `encode_chat` (message text never becomes special tokens) and streams
  its answer into its transcript. The finished answer is the decoded new text, the stop token left
  out (an answer that reached max new tokens first is marked as cut); Stop keeps the text so far, marked as stopped; a failure removes the empty answer (the
  message stays, Regenerate retries it).
- Regenerate answers the last message again (its answer replaced); Clear starts a new conversation
  (the system prompt stays). Neither runs while an answer is being generated.
"""
from __future__ import annotations

from engine.train.chat_template import ChatTemplate, ChatTemplateError, read_chat_template


class ChatSession:
    """The chat mode's commands, for `panel` (a GeneratePanel) and its view's `chat` (a ChatView)."""

    def __init__(self, panel):
        self.panel = panel
        self.view = panel.view.chat
        self.template: ChatTemplate | None = None
        self._template_for = None  # the folder whose template `template` is (None: not looked yet)
        self.last_messages: list[list[dict]] = []  # each column's messages of the last answer asked for
        self.view.send_requested.connect(self.send)
        self.view.regenerate_requested.connect(self.regenerate)
        self.view.clear_requested.connect(self.clear)

    @property
    def conversation(self):
        return self.view.conversation

    def take_template(self, module) -> None:
        """A model from another folder: its chat template, and chat mode chosen when it has one."""
        folder = self.panel.folder() if module is not None else ""
        if folder == self._template_for:
            return
        self._template_for = folder
        self.template, why = None, "Chat needs a model whose folder has a chat template."
        if folder:
            try:
                self.template = read_chat_template(folder)
            except ChatTemplateError as exc:
                why = f"Chat needs the model's chat template: {exc}"
        pv = self.panel.view
        pv.set_chat_available(self.template is not None, why)
        if self.template is not None:
            pv.set_mode("chat")

    # ---- commands -------------------------------------------------------------------------------
    def send(self, text: str | None = None):
        """The message (default: the message box's) added and answered; the task, or None."""
        p, v = self.panel, self.view
        text = v.input.toPlainText() if text is None else text
        p.view.error.show_error(None)
        if p.is_running() or not p.ready():
            return None
        if self.template is None:
            p.view.error.show_error("This model has no chat template: continue text instead, or open an instruct "
                                    "model.")
            return None
        if not text.strip():
            p.view.error.show_error("Type a message to send.")
            return None
        settings = p.view.settings()
        columns = p.columns_for(settings)
        if columns is None:
            return None
        self.conversation.add_user(text)
        v.input.clear()
        return self._answer(columns, settings)

    def regenerate(self):
        """The last message answered again; the task, or None."""
        p = self.panel
        p.view.error.show_error(None)
        if p.is_running() or not self.conversation.can_regenerate() or not p.ready() or self.template is None:
            return None
        settings = p.view.settings()
        columns = p.columns_for(settings)  # asked first: a refusal keeps the answer there is
        if columns is None:
            return None
        self.conversation.drop_answer()
        if not self.conversation.turns:
            self.view.refresh()
            return None
        return self._answer(columns, settings)

    def clear(self) -> None:
        if self.panel.is_running():
            return
        self.conversation.clear()
        self.view.refresh()
        self.panel.view.set_status("A new conversation.")

    # ---- the answer -----------------------------------------------------------------------------
    def _answer(self, columns, settings: dict):
        p, v = self.panel, self.view
        system = v.system_prompt()
        self.last_messages = [self.conversation.messages(c, system) for c in range(len(columns))]
        self.conversation.begin_answer(len(columns))
        v.set_columns(p.titles(columns, settings))
        settings = {**settings, "prompt": "", "chats": self.last_messages, "template": self.template}
        return p.start(columns, settings, v.append, "Stopped: the answer so far is kept.", self._ended)

    def _ended(self, kind: str, results) -> None:
        if kind == "finished":
            self.conversation.end_answer([r.text for r in results],
                                         cut=[r.finish_reasons[0] == "length" for r in results])
        elif kind == "failed":
            self.conversation.drop_answer()
        else:
            self.conversation.end_answer(stopped=True)
        self.view.refresh()
