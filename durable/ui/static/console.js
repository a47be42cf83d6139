// Remembers the operator token for this browser tab (sessionStorage, never a cookie) and
// fills it into every action form, so that it is typed once.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  const saved = sessionStorage.getItem("durable-token") || "";
  for (const form of document.querySelectorAll("form.action")) {
    const field = form.querySelector("input[name=token]");
    if (!field) continue;
    if (saved && !field.value) field.value = saved;
    form.addEventListener("submit", () => sessionStorage.setItem("durable-token", field.value));
  }
});
