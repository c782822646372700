"""A correct BatchNorm in a module that takes 2 s to import (a framework loading its kernels, say):
the import must happen outside every case's time limit, also in each fresh worker."""
import time

import torch.nn.functional as F

time.sleep(2.0)


def bn(input, running_mean, running_var, weight, bias, training, momentum, eps):
    return F.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
