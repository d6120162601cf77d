"""The names of the formats `trainguard analyze` reads, in a module of their own: the package
exports them and the readers' dispatch uses them, without importing each other."""

FORMATS: dict[str, str] = {
    "hf": "Hugging Face trainer_state.json",
    "lightning": "PyTorch Lightning CSVLogger metrics.csv",
    "keras": "Keras CSVLogger file (epoch,loss,...,val_loss per epoch)",
    "tensorboard": "TensorBoard event file or run directory",
    "tensorboard-csv": "TensorBoard's 'Download CSV' of one scalar (Wall time,Step,Value)",
    "wandb-csv": "W&B's 'Export panel data' CSV (\"Step\",\"<run> - <metric>\",...)",
    "store": "trainguard run directory (its run store)",
    "wandb": "Weights & Biases run directory (offline or synced), its .wandb file, or the wandb/ "
             "folder of runs",
    "mlflow": "MLflow run: mlflow.db, an mlruns folder, or a sqlite:/// or file:// tracking URI",
    "jsonl": "JSON Lines, one object per logged step",
    "json-series": "one JSON object of values by metric ({\"lm loss\": {\"values\": {...}}}, "
                   "Megatron-LM's golden values) or by step ({\"0\": {\"lm loss\": ...}})",
    "metric-csv": "one metric's CSV without a header ('epoch,step,value' lines, the file named "
                  "after the metric, as d3rlpy writes them)",
    "monitor": "Gym / Stable-Baselines3 Monitor file (monitor.csv: one line per episode, 'r,l,t')",
    "text": "text log (Megatron, word_language_model, nanoGPT, mlx-lm, generic lines or bare "
            "'step loss' columns)",
    "text:megatron": "text log, Megatron-LM / Megatron-DeepSpeed iteration lines only",
    "text:wlm": "text log, PyTorch examples/word_language_model lines only",
    "text:nanogpt": "text log, nanoGPT 'iter N: loss X' lines only",
    "text:mlx": "text log, mlx-lm 'Iter N: Train loss X' lines only",
    "text:llmc": "text log, llm.c main.log 's:N trl:X' lines only",
    "text:rl": "text log, OpenAI baselines / stable-baselines console tables only",
    "text:yolo": "text log, the Ultralytics YOLO / YOLOv5 training console only",
    "text:boosting": "text log, CatBoost / XGBoost / LightGBM iteration lines only",
    "text:mllog": "text log, MLPerf's ':::MLLOG {...}' event lines only",
    "text:deepxde": "text log, DeepXDE's loss.dat ('# step, loss_train, loss_test, "
                    "metrics_test') only",
    "text:history": "text log, Keras's History.history dict printed ({'loss': [...], ...}) "
                    "only",
    "text:rvector": "text log, R's printed numeric vectors ('> log$train', then '[1] 0.69 "
                    "0.52 ...') only",
    "text:table": "text log, a header line of column names (one a loss) over rows of numbers "
                  "only (Chainer's PrintReport, CSV lines pasted under prose)",
    "text:generic": "text log, generic 'step N ... loss X' lines only",
    "text:columns": "text log, bare 'step loss' lines only",
}
"""The formats `analyze` reads, by the name `--format` takes."""
