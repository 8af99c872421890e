# Sourced by the training scripts (train_smollm2.sh, eagle31_ab.sh): appends `eaglespec train`'s --self-prompts /
# --self-prompt-openers arguments to the array EXTRA from the environment.
#   SELF_PROMPTS: how many prompts the target writes (cached in the work dir); SELF_PROMPT_OPENERS: their first words,
#   cycled. Several sets, each with its own caches: separate them with ";" in both (SELF_PROMPTS="16000;20000"
#   SELF_PROMPT_OPENERS="Write,Solve;Write a story,How does").
IFS=';' read -r -a SP_N <<< "${SELF_PROMPTS:-}"
IFS=';' read -r -a SP_O <<< "${SELF_PROMPT_OPENERS:-}"
for i in "${!SP_N[@]}"; do
  EXTRA+=(--self-prompts "${SP_N[$i]}")
  if [ -n "${SELF_PROMPT_OPENERS:-}" ]; then EXTRA+=(--self-prompt-openers "${SP_O[$i]:-}"); fi
done
