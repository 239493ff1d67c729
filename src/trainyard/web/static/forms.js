// Asks before an action that cannot be undone (forms with data-confirm), and keeps a form from being
// sent twice by a double click.
(function () {
  "use strict";
  Array.prototype.forEach.call(document.querySelectorAll("form[data-confirm]"), function (form) {
    form.addEventListener("submit", function (ev) {
      if (!window.confirm(form.dataset.confirm)) { ev.preventDefault(); return; }
    });
  });
  Array.prototype.forEach.call(document.querySelectorAll("form[method=post]"), function (form) {
    form.addEventListener("submit", function (ev) {
      if (ev.defaultPrevented) return;
      if (form.dataset.sent) { ev.preventDefault(); return; }
      form.dataset.sent = "1";
    });
  });
})();
